// A memory dependency on a later op's token: a cycle through a token.
builtin.module attributes {turnip.devices = 2 : i64, turnip.budget = 4096 : i64} {
  %n0, %n0t = turnip.input at <0, 0, 64> {task = "a"} : tensor<4x4xf32>
  %n1, %n1t = turnip.relu %n0 at <0, 64, 64> after [%n2t] {task = "b"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %n2, %n2t = turnip.exp %n1 at <0, 128, 64> {task = "c"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
}
