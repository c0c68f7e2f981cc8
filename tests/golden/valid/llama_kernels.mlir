// The LLaMA kernels: rope, swiglu, and a two-block attention chain (a packed float32 partial, then the
// causal diagonal block), grouped-query 4:2 heads of width 4; int, bool and float attributes.
builtin.module attributes {turnip.devices = 1 : i64} {
  %x = turnip.input on 0 : tensor<4x16xf16>
  %cos = turnip.input on 0 : tensor<4x4xf16>
  %sin = turnip.input on 0 : tensor<4x4xf16>
  %k0 = turnip.input on 0 : tensor<4x8xf16>
  %k1 = turnip.input on 0 : tensor<4x8xf16>
  %q = turnip.rope %x, %cos, %sin on 0 : (tensor<4x16xf16>, tensor<4x4xf16>, tensor<4x4xf16>) -> tensor<4x16xf16>
  %p = turnip.attention %q, %k0, %k0 on 0 {heads = 4, kv_heads = 2 : i64, final = false} : (tensor<4x16xf16>, tensor<4x8xf16>, tensor<4x8xf16>) -> tensor<4x20xf32>
  %o = turnip.attention %q, %k1, %k1, %p on 0 {heads = 4 : i64, kv_heads = 2 : i64, causal = true, final = true, softmax_scale = 0.5 : f64} : (tensor<4x16xf16>, tensor<4x8xf16>, tensor<4x8xf16>, tensor<4x20xf32>) -> tensor<4x16xf16>
  %s = turnip.swiglu %o, %x on 0 : (tensor<4x16xf16>, tensor<4x16xf16>) -> tensor<4x16xf16>
  turnip.output %s : tensor<4x16xf16>
}
