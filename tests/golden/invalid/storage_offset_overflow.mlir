// A storage offset past 64 bits is refused at the integer, as JSON refuses one of 2**62 or more.
builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 4096 : i64} {
  %a, %at = turnip.input in <99999999999999999999999, 64> : tensor<4x4xf32>
}
