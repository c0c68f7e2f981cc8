// segments cut a block of packed sequences, which must be causal: this one is not.
builtin.module attributes {turnip.devices = 1 : i64} {
  %q = turnip.input on 0 : tensor<6x16xf32>
  %k = turnip.input on 0 : tensor<6x8xf32>
  %o = turnip.attention %q, %k, %k on 0 {heads = 4, kv_heads = 2, segments = "1,4"} : (tensor<6x16xf32>, tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x16xf32>
}
