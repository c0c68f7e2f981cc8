// prev must be a float32 packed partial.
builtin.module attributes {turnip.devices = 1 : i64} {
  %q = turnip.input on 0 : tensor<4x16xf32>
  %k = turnip.input on 0 : tensor<4x8xf32>
  %p = turnip.input on 0 : tensor<4x20xf16>
  %o = turnip.attention %q, %k, %k, %p on 0 {heads = 4, kv_heads = 2} : (tensor<4x16xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x20xf16>) -> tensor<4x16xf32>
}
