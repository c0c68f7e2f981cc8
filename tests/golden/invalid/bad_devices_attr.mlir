// turnip.devices must be a positive integer.
builtin.module attributes {turnip.devices = 0 : i64} {
  %a = turnip.input on 0 : tensor<4x4xf32>
}
