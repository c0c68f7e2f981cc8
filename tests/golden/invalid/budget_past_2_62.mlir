// A budget of 2**62 or more is refused, as JSON refuses such a budget.
builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 4611686018427387904 : i64} {
  %a = turnip.input on 0 : tensor<4xf32>
  turnip.output %a : tensor<4xf32>
}
