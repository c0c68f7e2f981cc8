// causal is a bool (true or false), not an integer.
builtin.module attributes {turnip.devices = 1 : i64} {
  %q, %qt = turnip.input on 0 : tensor<4x16xf32>
  %k, %kt = turnip.input on 0 : tensor<4x8xf32>
  %o, %ot = turnip.attention %q, %k, %k on 0 {heads = 4, kv_heads = 2, causal = 1} : (tensor<4x16xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x16xf32>
}
