builtin.module attributes {turnip.devices = 2 : i64} {
  %x, %xt = turnip.input on 0 : tensor<16x16xf32>
  %y, %yt = turnip.input on 1 : tensor<16x16xf32>
  %a, %at = turnip.relu %x on 0 : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %b, %bt = turnip.relu %y on 1 : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %b.to0, %b.to0t = turnip.move %b to 0 : tensor<16x16xf32>
  %c, %ct = turnip.add %a, %b.to0 on 0 : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %c : tensor<16x16xf32>
}

