// A missing ':' before the result type.
builtin.module attributes {turnip.devices = 2 : i64} {
  %x = turnip.input on 0 tensor<4x4xf32>
}
