// segments are the rows where each packed sequence after the first starts: increasing, inside (0, 6).
builtin.module attributes {turnip.devices = 1 : i64} {
  %q = turnip.input on 0 : tensor<6x16xf32>
  %k = turnip.input on 0 : tensor<6x8xf32>
  %o = turnip.attention %q, %k, %k on 0 {heads = 4, kv_heads = 2, causal = true, segments = "4,1"} : (tensor<6x16xf32>, tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x16xf32>
}
