// PIPELINE: turnip-memgraph{budget=2048}
// EXIT: 2
// c = a + b needs three tiles at once: 3072 bytes do not fit a 2048-byte GPU.
builtin.module attributes {turnip.devices = 1 : i64} {
  %x = turnip.input on 0 : tensor<16x16xf32>
  %a = turnip.relu %x on 0 : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %b = turnip.scale %x on 0 {factor = 5.000000e-01 : f64} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %c = turnip.add %a, %b on 0 : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %d = turnip.mul %c, %x on 0 : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %e = turnip.add %d, %a on 0 : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %f = turnip.add %e, %b on 0 : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %f : tensor<16x16xf32>
}
