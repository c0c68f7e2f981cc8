// An input is either at a GPU location or in CPU storage.
builtin.module attributes {turnip.devices = 2 : i64, turnip.budget = 4096 : i64} {
  %a, %at = turnip.input at <0, 0, 64> in <0, 64> : tensor<4x4xf32>
}
