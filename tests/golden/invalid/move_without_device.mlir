// A move must name its destination GPU.
builtin.module attributes {turnip.devices = 2 : i64} {
  %a = turnip.input on 0 : tensor<4x4xf32>
  %b = turnip.move %a : tensor<4x4xf32>
}
