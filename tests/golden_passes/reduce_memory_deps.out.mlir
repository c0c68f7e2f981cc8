builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 3072 : i64} {
  %x, %xt = turnip.input at <0, 0, 1024> : tensor<16x16xf32>
  %a, %at = turnip.relu %x at <0, 1024, 1024> : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %b, %bt = turnip.exp %x at <0, 2048, 1024> : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %c, %ct = turnip.relu %a at <0, 0, 1024> after[%bt] : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %d, %dt = turnip.add %c, %b at <0, 1024, 1024> : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %d : tensor<16x16xf32>
}

