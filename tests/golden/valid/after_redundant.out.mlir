builtin.module attributes {turnip.devices = 2 : i64, turnip.budget = 4096 : i64} {
  %a, %at = turnip.input at <0, 0, 1024> : tensor<16x16xf32>
  %b, %bt = turnip.exp %a at <0, 1024, 1024> : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %b.offload1, %b.offload1t = turnip.offload %b on 0 to <0, 1024> after[%at] : tensor<16x16xf32>
  %c, %ct = turnip.relu %a at <0, 1024, 1024> after[%b.offload1t] redundant[%bt] : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %d, %dt = turnip.move %c to 1 at <1, 0, 1024> after[%at, %bt] redundant[%b.offload1t] : tensor<16x16xf32>
  %b.reload1, %b.reload1t = turnip.reload %b.offload1 at <0, 0, 1024> after[%ct, %dt] redundant[%bt] : tensor<16x16xf32>
  turnip.output %d, %b.reload1 : tensor<16x16xf32>, tensor<16x16xf32>
}
