builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 5120 : i64} {
  %x, %xt = turnip.input at <0, 0, 1024> : tensor<16x16xf32>
  %a, %at = turnip.relu %x at <0, 1024, 1024> : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %b, %bt = turnip.scale %x at <0, 2048, 1024> {factor = 5.000000e-01 : f64} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %c, %ct = turnip.add %a, %b at <0, 3072, 1024> : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %d, %dt = turnip.mul %c, %x at <0, 4096, 1024> : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %e, %et = turnip.add %d, %a at <0, 0, 1024> redundant[%xt, %at, %bt, %dt] : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %f, %ft = turnip.add %e, %b at <0, 3072, 1024> redundant[%ct, %dt] : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %f : tensor<16x16xf32>
}

