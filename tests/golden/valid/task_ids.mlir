// Task ids that are not plain SSA names keep a `task` property; plain ones are the value's name.
builtin.module attributes {turnip.devices = 1 : i64} {
  %x = turnip.input on 0 : tensor<4x4xf16>
  %blk.0.1. = turnip.input on 0 {task = "blk[0,1]"} : tensor<4x4xf16>
  %x_1 = turnip.add %x, %blk.0.1. on 0 {task = "x_1"} : (tensor<4x4xf16>, tensor<4x4xf16>) -> tensor<4x4xf16>
  turnip.output %x_1 : tensor<4x4xf16>
}
