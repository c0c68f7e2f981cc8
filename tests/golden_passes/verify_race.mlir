// PIPELINE: turnip-verify-memgraph
// EXIT: 3
// c overwrites a's location but nothing orders it after a's writer (or a's reader b): a race.
builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 3072 : i64} {
  %n0, %n0t = turnip.input at <0, 0, 1024> {task = "x"} : tensor<16x16xf32>
  %n1, %n1t = turnip.relu %n0 at <0, 1024, 1024> {task = "a"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n2, %n2t = turnip.relu %n1 at <0, 2048, 1024> {task = "b"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n3, %n3t = turnip.exp %n0 at <0, 1024, 1024> {task = "c"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %n2, %n3 : tensor<16x16xf32>, tensor<16x16xf32>
}
