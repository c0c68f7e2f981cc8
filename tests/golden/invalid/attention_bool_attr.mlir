// causal is a bool (true or false), not an integer.
builtin.module attributes {turnip.devices = 1 : i64} {
  %q = turnip.input on 0 : tensor<4x16xf32>
  %k = turnip.input on 0 : tensor<4x8xf32>
  %o = turnip.attention %q, %k, %k on 0 {heads = 4, kv_heads = 2, causal = 1} : (tensor<4x16xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x16xf32>
}
