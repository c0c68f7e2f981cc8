// heads 3 does not divide the q width 16.
builtin.module attributes {turnip.devices = 1 : i64} {
  %q = turnip.input on 0 : tensor<4x16xf32>
  %k = turnip.input on 0 : tensor<4x8xf32>
  %o = turnip.attention %q, %k, %k on 0 {heads = 3, kv_heads = 1} : (tensor<4x16xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x16xf32>
}
