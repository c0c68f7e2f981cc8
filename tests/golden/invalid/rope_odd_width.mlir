// rope needs an even head width (cos and sin columns).
builtin.module attributes {turnip.devices = 1 : i64} {
  %q, %qt = turnip.input on 0 : tensor<4x16xf32>
  %k, %kt = turnip.input on 0 : tensor<4x8xf32>
  %c, %ct = turnip.input on 0 : tensor<4x3xf32>
  %r, %rt = turnip.rope %q, %c, %c on 0 : (tensor<4x16xf32>, tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x16xf32>
}
