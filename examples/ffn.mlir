builtin.module attributes {turnip.devices = 1 : i64} {
  %x, %xt = turnip.input on 0 : tensor<64x128xf32>
  %w1.0, %w1.0t = turnip.input on 0 : tensor<256x128xf32>
  %up0, %up0t = turnip.einsum %x, %w1.0 on 0 {equation = "ti,oi->to"} : (tensor<64x128xf32>, tensor<256x128xf32>) -> tensor<64x256xf32>
  %act0, %act0t = turnip.gelu %up0 on 0 : (tensor<64x256xf32>) -> tensor<64x256xf32>
  %w2.0, %w2.0t = turnip.input on 0 : tensor<128x256xf32>
  %down0, %down0t = turnip.einsum %act0, %w2.0 on 0 {equation = "tf,of->to"} : (tensor<64x256xf32>, tensor<128x256xf32>) -> tensor<64x128xf32>
  %w1.1, %w1.1t = turnip.input on 0 : tensor<256x128xf32>
  %up1, %up1t = turnip.einsum %down0, %w1.1 on 0 {equation = "ti,oi->to"} : (tensor<64x128xf32>, tensor<256x128xf32>) -> tensor<64x256xf32>
  %act1, %act1t = turnip.gelu %up1 on 0 : (tensor<64x256xf32>) -> tensor<64x256xf32>
  %w2.1, %w2.1t = turnip.input on 0 : tensor<128x256xf32>
  %down1, %down1t = turnip.einsum %act1, %w2.1 on 0 {equation = "tf,of->to"} : (tensor<64x256xf32>, tensor<128x256xf32>) -> tensor<64x128xf32>
  %w1.2, %w1.2t = turnip.input on 0 : tensor<256x128xf32>
  %up2, %up2t = turnip.einsum %down1, %w1.2 on 0 {equation = "ti,oi->to"} : (tensor<64x128xf32>, tensor<256x128xf32>) -> tensor<64x256xf32>
  %act2, %act2t = turnip.gelu %up2 on 0 : (tensor<64x256xf32>) -> tensor<64x256xf32>
  %w2.2, %w2.2t = turnip.input on 0 : tensor<128x256xf32>
  %down2, %down2t = turnip.einsum %act2, %w2.2 on 0 {equation = "tf,of->to"} : (tensor<64x256xf32>, tensor<128x256xf32>) -> tensor<64x128xf32>
  %w1.3, %w1.3t = turnip.input on 0 : tensor<256x128xf32>
  %up3, %up3t = turnip.einsum %down2, %w1.3 on 0 {equation = "ti,oi->to"} : (tensor<64x128xf32>, tensor<256x128xf32>) -> tensor<64x256xf32>
  %act3, %act3t = turnip.gelu %up3 on 0 : (tensor<64x256xf32>) -> tensor<64x256xf32>
  %w2.3, %w2.3t = turnip.input on 0 : tensor<128x256xf32>
  %y, %yt = turnip.einsum %act3, %w2.3 on 0 {equation = "tf,of->to"} : (tensor<64x256xf32>, tensor<128x256xf32>) -> tensor<64x128xf32>
  turnip.output %y : tensor<64x128xf32>
}
