// A memory dependency on a later op's token: a cycle through a token.
builtin.module attributes {turnip.devices = 2 : i64, turnip.budget = 4096 : i64} {
  %a, %at = turnip.input at <0, 0, 64> : tensor<4x4xf32>
  %b, %bt = turnip.relu %a at <0, 64, 64> after [%ct] : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %c, %ct = turnip.exp %b at <0, 128, 64> : (tensor<4x4xf32>) -> tensor<4x4xf32>
}
