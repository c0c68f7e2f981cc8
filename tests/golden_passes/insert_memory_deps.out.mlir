builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 4096 : i64} {
  %x, %xt = turnip.input at <0, 0, 1024> : tensor<16x16xf32>
  %a, %at = turnip.relu %x at <0, 1024, 1024> : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %b, %bt = turnip.scale %x at <0, 2048, 1024> {factor = 5.000000e-01 : f64} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %c, %ct = turnip.add %a, %b at <0, 3072, 1024> : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %b.offload1, %b.offload1t = turnip.offload %b on 0 to <0, 1024> : tensor<16x16xf32>
  %d, %dt = turnip.mul %c, %x at <0, 2048, 1024> after[%b.offload1t] redundant[%bt, %ct] : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %e, %et = turnip.add %d, %a at <0, 0, 1024> redundant[%xt, %at, %bt, %dt] : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %b.reload1, %b.reload1t = turnip.reload %b.offload1 at <0, 3072, 1024> after[%ct, %dt] : tensor<16x16xf32>
  %f, %ft = turnip.add %e, %b.reload1 at <0, 1024, 1024> redundant[%at, %ct, %et] : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %f : tensor<16x16xf32>
}

