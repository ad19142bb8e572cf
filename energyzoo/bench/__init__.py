"""What `energyzoo bench` and `energyzoo doctor` measure: the speed benchmark (`speed`, its workloads and tables in
`table`), the big-model loading benchmark (`offload`), the kernel and family checks of the doctor (`kernels`,
`families`, on a seeded batch of any task from `task_inputs`) and the GPU check (`gpu_check`)."""
