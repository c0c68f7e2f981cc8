// An input tensor placed on GPU 1 of 2.
builtin.module attributes {turnip.devices = 2 : i64} {
  %x = turnip.input on 1 : tensor<64x32xf32>
  turnip.output %x : tensor<64x32xf32>
}
