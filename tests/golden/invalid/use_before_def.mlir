// %b is used on line 3 but defined on line 4.
builtin.module attributes {turnip.devices = 2 : i64} {
  %a = turnip.input on 0 : tensor<4x4xf32>
  %c = turnip.add %a, %b on 0 : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %b = turnip.input on 0 : tensor<4x4xf32>
}
