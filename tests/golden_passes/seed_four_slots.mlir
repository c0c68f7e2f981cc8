// PIPELINE: turnip-memgraph{budget=4096}
// The same graph on a GPU that holds four: one offload/reload pair (b is needed again only by f).
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
