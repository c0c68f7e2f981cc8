builtin.module {
  %x, %xt = turnip.input on 2 : tensor<4xf32>
  %y, %yt = turnip.move %x to 0 : tensor<4xf32>
}
