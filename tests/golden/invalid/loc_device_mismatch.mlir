// A move to GPU 1 whose location is on GPU 0.
builtin.module attributes {turnip.devices = 2 : i64, turnip.budget = 4096 : i64} {
  %a, %at = turnip.input at <0, 0, 64> : tensor<4x4xf32>
  %b, %bt = turnip.move %a to 1 at <0, 64, 64> : tensor<4x4xf32>
}
