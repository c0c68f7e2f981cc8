// rope needs an even head width (cos and sin columns).
builtin.module attributes {turnip.devices = 1 : i64} {
  %q = turnip.input on 0 : tensor<4x16xf32>
  %k = turnip.input on 0 : tensor<4x8xf32>
  %c = turnip.input on 0 : tensor<4x3xf32>
  %r = turnip.rope %q, %c, %c on 0 : (tensor<4x16xf32>, tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x16xf32>
}
