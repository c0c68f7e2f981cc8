// Device 2 of a 2-GPU module.
builtin.module attributes {turnip.devices = 2 : i64} {
  %a = turnip.input on 2 : tensor<4x4xf32>
}
