// Taskgraph text from before tokens were memgraph-only binds a token on every op; it still parses
// (the ops keep their tokens here; converted to a taskgraph and back, they print without).
builtin.module attributes {turnip.devices = 1 : i64} {
  %x, %xt = turnip.input on 0 : tensor<4x4xf32>
  %y, %yt = turnip.relu %x on 0 : (tensor<4x4xf32>) -> tensor<4x4xf32>
  turnip.output %y : tensor<4x4xf32>
}
