builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 4096 : i64} {
  %a, %at = turnip.input at <-1, 0, 1024> : tensor<16x16xf32>
}
