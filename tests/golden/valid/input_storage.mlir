// A memgraph input that starts in CPU storage and is reloaded onto GPU 0.
builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 16384 : i64} {
  %n0, %n0t = turnip.input in <0, 16384> {task = "w"} : tensor<64x64xf32>
  %n1, %n1t = turnip.reload %n0 at <0, 0, 16384> {task = "w"} : tensor<64x64xf32>
  turnip.output %n1 : tensor<64x64xf32>
}
