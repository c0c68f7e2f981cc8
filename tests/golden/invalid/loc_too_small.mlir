// A 4x4xf32 tensor needs 64 bytes, its location has 32.
builtin.module attributes {turnip.devices = 2 : i64, turnip.budget = 4096 : i64} {
  %a, %at = turnip.input at <0, 0, 32> : tensor<4x4xf32>
}
