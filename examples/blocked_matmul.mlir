builtin.module attributes {turnip.devices = 3 : i64} {
  %A.0.0., %A.0.0.t = turnip.input on 0 {task = "A[0,0]"} : tensor<128x128xf32>
  %A.0.1., %A.0.1.t = turnip.input on 1 {task = "A[0,1]"} : tensor<128x128xf32>
  %A.1.0., %A.1.0.t = turnip.input on 1 {task = "A[1,0]"} : tensor<128x128xf32>
  %A.1.1., %A.1.1.t = turnip.input on 2 {task = "A[1,1]"} : tensor<128x128xf32>
  %B.0.0., %B.0.0.t = turnip.input on 0 {task = "B[0,0]"} : tensor<128x128xf32>
  %B.0.1., %B.0.1.t = turnip.input on 1 {task = "B[0,1]"} : tensor<128x128xf32>
  %B.1.0., %B.1.0.t = turnip.input on 1 {task = "B[1,0]"} : tensor<128x128xf32>
  %B.1.1., %B.1.1.t = turnip.input on 2 {task = "B[1,1]"} : tensor<128x128xf32>
  %C.0.0..p0, %C.0.0..p0t = turnip.matmul %A.0.0., %B.0.0. on 0 {task = "C[0,0].p0"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %C.0.0..p1, %C.0.0..p1t = turnip.matmul %A.0.1., %B.1.0. on 1 {task = "C[0,0].p1"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %C.0.0..p1.to0, %C.0.0..p1.to0t = turnip.move %C.0.0..p1 to 0 {task = "C[0,0].p1.to0"} : tensor<128x128xf32>
  %C.0.0., %C.0.0.t = turnip.add %C.0.0..p0, %C.0.0..p1.to0 on 0 {task = "C[0,0]"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %A.0.0..to1, %A.0.0..to1t = turnip.move %A.0.0. to 1 {task = "A[0,0].to1"} : tensor<128x128xf32>
  %C.0.1..p0, %C.0.1..p0t = turnip.matmul %A.0.0..to1, %B.0.1. on 1 {task = "C[0,1].p0"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %A.0.1..to2, %A.0.1..to2t = turnip.move %A.0.1. to 2 {task = "A[0,1].to2"} : tensor<128x128xf32>
  %C.0.1..p1, %C.0.1..p1t = turnip.matmul %A.0.1..to2, %B.1.1. on 2 {task = "C[0,1].p1"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %C.0.1..p1.to1, %C.0.1..p1.to1t = turnip.move %C.0.1..p1 to 1 {task = "C[0,1].p1.to1"} : tensor<128x128xf32>
  %C.0.1., %C.0.1.t = turnip.add %C.0.1..p0, %C.0.1..p1.to1 on 1 {task = "C[0,1]"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %B.0.0..to1, %B.0.0..to1t = turnip.move %B.0.0. to 1 {task = "B[0,0].to1"} : tensor<128x128xf32>
  %C.1.0..p0, %C.1.0..p0t = turnip.matmul %A.1.0., %B.0.0..to1 on 1 {task = "C[1,0].p0"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %B.1.0..to2, %B.1.0..to2t = turnip.move %B.1.0. to 2 {task = "B[1,0].to2"} : tensor<128x128xf32>
  %C.1.0..p1, %C.1.0..p1t = turnip.matmul %A.1.1., %B.1.0..to2 on 2 {task = "C[1,0].p1"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %C.1.0..p1.to1, %C.1.0..p1.to1t = turnip.move %C.1.0..p1 to 1 {task = "C[1,0].p1.to1"} : tensor<128x128xf32>
  %C.1.0., %C.1.0.t = turnip.add %C.1.0..p0, %C.1.0..p1.to1 on 1 {task = "C[1,0]"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %A.1.0..to2, %A.1.0..to2t = turnip.move %A.1.0. to 2 {task = "A[1,0].to2"} : tensor<128x128xf32>
  %B.0.1..to2, %B.0.1..to2t = turnip.move %B.0.1. to 2 {task = "B[0,1].to2"} : tensor<128x128xf32>
  %C.1.1..p0, %C.1.1..p0t = turnip.matmul %A.1.0..to2, %B.0.1..to2 on 2 {task = "C[1,1].p0"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %A.1.1..to0, %A.1.1..to0t = turnip.move %A.1.1. to 0 {task = "A[1,1].to0"} : tensor<128x128xf32>
  %B.1.1..to0, %B.1.1..to0t = turnip.move %B.1.1. to 0 {task = "B[1,1].to0"} : tensor<128x128xf32>
  %C.1.1..p1, %C.1.1..p1t = turnip.matmul %A.1.1..to0, %B.1.1..to0 on 0 {task = "C[1,1].p1"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %C.1.1..p1.to2, %C.1.1..p1.to2t = turnip.move %C.1.1..p1 to 2 {task = "C[1,1].p1.to2"} : tensor<128x128xf32>
  %C.1.1., %C.1.1.t = turnip.add %C.1.1..p0, %C.1.1..p1.to2 on 2 {task = "C[1,1]"} : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  turnip.output %C.0.0., %C.0.1., %C.1.0., %C.1.1. : tensor<128x128xf32>, tensor<128x128xf32>, tensor<128x128xf32>, tensor<128x128xf32>
}
