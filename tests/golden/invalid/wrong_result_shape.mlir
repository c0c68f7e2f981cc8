// matmul of 4x8 and 8x2 gives 4x2, not 4x8.
builtin.module attributes {turnip.devices = 2 : i64} {
  %a = turnip.input on 0 : tensor<4x8xf32>
  %b = turnip.input on 0 : tensor<8x2xf32>
  %c = turnip.matmul %a, %b on 0 : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x8xf32>
}
