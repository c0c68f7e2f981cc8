// matmul inner dimensions must agree.
builtin.module attributes {turnip.devices = 2 : i64} {
  %a = turnip.input on 0 : tensor<4x8xf32>
  %b = turnip.input on 0 : tensor<4x2xf32>
  %c = turnip.matmul %a, %b on 0 : (tensor<4x8xf32>, tensor<4x2xf32>) -> tensor<4x2xf32>
}
