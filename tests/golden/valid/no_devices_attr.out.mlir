builtin.module {
  %x = turnip.input on 2 : tensor<4xf32>
  %y = turnip.move %x to 0 : tensor<4xf32>
}
