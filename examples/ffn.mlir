builtin.module attributes {turnip.devices = 1 : i64} {
  %x = turnip.input on 0 : tensor<64x128xf32>
  %w1.0 = turnip.input on 0 : tensor<256x128xf32>
  %up0 = turnip.einsum %x, %w1.0 on 0 {equation = "ti,oi->to"} : (tensor<64x128xf32>, tensor<256x128xf32>) -> tensor<64x256xf32>
  %act0 = turnip.gelu %up0 on 0 : (tensor<64x256xf32>) -> tensor<64x256xf32>
  %w2.0 = turnip.input on 0 : tensor<128x256xf32>
  %down0 = turnip.einsum %act0, %w2.0 on 0 {equation = "tf,of->to"} : (tensor<64x256xf32>, tensor<128x256xf32>) -> tensor<64x128xf32>
  %w1.1 = turnip.input on 0 : tensor<256x128xf32>
  %up1 = turnip.einsum %down0, %w1.1 on 0 {equation = "ti,oi->to"} : (tensor<64x128xf32>, tensor<256x128xf32>) -> tensor<64x256xf32>
  %act1 = turnip.gelu %up1 on 0 : (tensor<64x256xf32>) -> tensor<64x256xf32>
  %w2.1 = turnip.input on 0 : tensor<128x256xf32>
  %down1 = turnip.einsum %act1, %w2.1 on 0 {equation = "tf,of->to"} : (tensor<64x256xf32>, tensor<128x256xf32>) -> tensor<64x128xf32>
  %w1.2 = turnip.input on 0 : tensor<256x128xf32>
  %up2 = turnip.einsum %down1, %w1.2 on 0 {equation = "ti,oi->to"} : (tensor<64x128xf32>, tensor<256x128xf32>) -> tensor<64x256xf32>
  %act2 = turnip.gelu %up2 on 0 : (tensor<64x256xf32>) -> tensor<64x256xf32>
  %w2.2 = turnip.input on 0 : tensor<128x256xf32>
  %down2 = turnip.einsum %act2, %w2.2 on 0 {equation = "tf,of->to"} : (tensor<64x256xf32>, tensor<128x256xf32>) -> tensor<64x128xf32>
  %w1.3 = turnip.input on 0 : tensor<256x128xf32>
  %up3 = turnip.einsum %down2, %w1.3 on 0 {equation = "ti,oi->to"} : (tensor<64x128xf32>, tensor<256x128xf32>) -> tensor<64x256xf32>
  %act3 = turnip.gelu %up3 on 0 : (tensor<64x256xf32>) -> tensor<64x256xf32>
  %w2.3 = turnip.input on 0 : tensor<128x256xf32>
  %y = turnip.einsum %act3, %w2.3 on 0 {equation = "tf,of->to"} : (tensor<64x256xf32>, tensor<128x256xf32>) -> tensor<64x128xf32>
  turnip.output %y : tensor<64x128xf32>
}
