builtin.module attributes {turnip.devices = 1 : i64} {
  %x = turnip.input on 0 : tensor<2x2xf32>
  %y = turnip.scale %x on 0 {factor = 2.000000e+00 : f64} : (tensor<2x2xf32>) -> tensor<2x2xf32>
  turnip.output %y : tensor<2x2xf32>
}
