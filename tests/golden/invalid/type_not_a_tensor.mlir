builtin.module attributes {turnip.devices = 1 : i64} {
  %a = turnip.input on 0 : bf16
}
