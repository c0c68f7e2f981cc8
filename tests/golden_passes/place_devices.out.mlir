builtin.module attributes {turnip.devices = 2 : i64} {
  %x = turnip.input on 0 : tensor<16x16xf32>
  %y = turnip.input on 1 : tensor<16x16xf32>
  %a = turnip.relu %x on 0 : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %b = turnip.relu %y on 1 : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %b.to0 = turnip.move %b to 0 : tensor<16x16xf32>
  %c = turnip.add %a, %b.to0 on 0 : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %c : tensor<16x16xf32>
}

