// A move to device 5 of a 2-GPU module.
builtin.module attributes {turnip.devices = 2 : i64} {
  %a = turnip.input on 0 : tensor<4x4xf32>
  %b = turnip.move %a to 5 : tensor<4x4xf32>
}
