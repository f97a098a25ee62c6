module github.com/marksplit/marksplit/test/kernels

go 1.26.0
