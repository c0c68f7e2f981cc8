// PIPELINE: turnip-verify-memgraph
// EXIT: 3
// c overwrites a's location but nothing orders it after a's writer (or a's reader b): a race.
builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 3072 : i64} {
  %x, %xt = turnip.input at <0, 0, 1024> : tensor<16x16xf32>
  %a, %at = turnip.relu %x at <0, 1024, 1024> : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %b, %bt = turnip.relu %a at <0, 2048, 1024> : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %c, %ct = turnip.exp %x at <0, 1024, 1024> : (tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %b, %c : tensor<16x16xf32>, tensor<16x16xf32>
}
