// The location [4064, 4128) ends past the 4096-byte budget.
builtin.module attributes {turnip.devices = 2 : i64, turnip.budget = 4096 : i64} {
  %a, %at = turnip.input at <0, 4064, 64> : tensor<4x4xf32>
}
