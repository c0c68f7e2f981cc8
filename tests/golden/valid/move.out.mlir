builtin.module attributes {turnip.devices = 3 : i64} {
  %x = turnip.input on 0 : tensor<16x16xbf16>
  %y = turnip.move %x to 2 : tensor<16x16xbf16>
  %z = turnip.relu %y on 2 : (tensor<16x16xbf16>) -> tensor<16x16xbf16>
  turnip.output %z : tensor<16x16xbf16>
}
