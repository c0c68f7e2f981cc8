// PIPELINE: turnip-insert-offload{budget=4096},turnip-insert-memory-deps
// Reuse edges added (after [...]), and the edges a data path already implies marked redundant [...].
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
