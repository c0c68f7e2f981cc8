builtin.module attributes {turnip.devices = 3 : i64} {
  %A.0.0. = turnip.input on 0 {task = "A[0,0]"} : tensor<128x128xf32>
  %A.0.1. = turnip.input on 1 {task = "A[0,1]"} : tensor<128x128xf32>
  %A.1.0. = turnip.input on 1 {task = "A[1,0]"} : tensor<128x128xf32>
  %A.1.1. = turnip.input on 2 {task = "A[1,1]"} : tensor<128x128xf32>
  %B.0.0. = turnip.input on 0 {task = "B[0,0]"} : tensor<128x128xf32>
  %B.0.1. = turnip.input on 1 {task = "B[0,1]"} : tensor<128x128xf32>
  %B.1.0. = turnip.input on 1 {task = "B[1,0]"} : tensor<128x128xf32>
  %B.1.1. = turnip.input on 2 {task = "B[1,1]"} : tensor<128x128xf32>
  %C.0.0..p0 = turnip.matmul %A.0.0., %B.0.0. on 0 {task = "C[0,0].p0"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %C.0.0..p1 = turnip.matmul %A.0.1., %B.1.0. on 1 {task = "C[0,0].p1"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %C.0.0..p1.to0 = turnip.move %C.0.0..p1 to 0 {task = "C[0,0].p1.to0"} : tensor<128x128xf32>
  %C.0.0. = turnip.add %C.0.0..p0, %C.0.0..p1.to0 on 0 {task = "C[0,0]"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %A.0.0..to1 = turnip.move %A.0.0. to 1 {task = "A[0,0].to1"} : tensor<128x128xf32>
  %C.0.1..p0 = turnip.matmul %A.0.0..to1, %B.0.1. on 1 {task = "C[0,1].p0"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %A.0.1..to2 = turnip.move %A.0.1. to 2 {task = "A[0,1].to2"} : tensor<128x128xf32>
  %C.0.1..p1 = turnip.matmul %A.0.1..to2, %B.1.1. on 2 {task = "C[0,1].p1"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %C.0.1..p1.to1 = turnip.move %C.0.1..p1 to 1 {task = "C[0,1].p1.to1"} : tensor<128x128xf32>
  %C.0.1. = turnip.add %C.0.1..p0, %C.0.1..p1.to1 on 1 {task = "C[0,1]"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %B.0.0..to1 = turnip.move %B.0.0. to 1 {task = "B[0,0].to1"} : tensor<128x128xf32>
  %C.1.0..p0 = turnip.matmul %A.1.0., %B.0.0..to1 on 1 {task = "C[1,0].p0"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %B.1.0..to2 = turnip.move %B.1.0. to 2 {task = "B[1,0].to2"} : tensor<128x128xf32>
  %C.1.0..p1 = turnip.matmul %A.1.1., %B.1.0..to2 on 2 {task = "C[1,0].p1"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %C.1.0..p1.to1 = turnip.move %C.1.0..p1 to 1 {task = "C[1,0].p1.to1"} : tensor<128x128xf32>
  %C.1.0. = turnip.add %C.1.0..p0, %C.1.0..p1.to1 on 1 {task = "C[1,0]"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %A.1.0..to2 = turnip.move %A.1.0. to 2 {task = "A[1,0].to2"} : tensor<128x128xf32>
  %B.0.1..to2 = turnip.move %B.0.1. to 2 {task = "B[0,1].to2"} : tensor<128x128xf32>
  %C.1.1..p0 = turnip.matmul %A.1.0..to2, %B.0.1..to2 on 2 {task = "C[1,1].p0"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %A.1.1..to0 = turnip.move %A.1.1. to 0 {task = "A[1,1].to0"} : tensor<128x128xf32>
  %B.1.1..to0 = turnip.move %B.1.1. to 0 {task = "B[1,1].to0"} : tensor<128x128xf32>
  %C.1.1..p1 = turnip.matmul %A.1.1..to0, %B.1.1..to0 on 0 {task = "C[1,1].p1"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %C.1.1..p1.to2 = turnip.move %C.1.1..p1 to 2 {task = "C[1,1].p1.to2"} : tensor<128x128xf32>
  %C.1.1. = turnip.add %C.1.1..p0, %C.1.1..p1.to2 on 2 {task = "C[1,1]"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  turnip.output %C.0.0., %C.0.1., %C.1.0., %C.1.1. : tensor<128x128xf32>, tensor<128x128xf32>, tensor<128x128xf32>, tensor<128x128xf32>
}
