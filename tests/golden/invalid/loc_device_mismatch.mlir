// A move to GPU 1 whose location is on GPU 0.
builtin.module attributes {turnip.devices = 2 : i64, turnip.budget = 4096 : i64} {
  %n0, %n0t = turnip.input at <0, 0, 64> {task = "a"} : tensor<4x4xf32>
  %n1, %n1t = turnip.move %n0 to 1 at <0, 64, 64> {task = "b"} : tensor<4x4xf32>
}
