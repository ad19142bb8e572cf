"""Evaluation: lm-evaluation-harness suites (`harness`, `suites`), the speed benchmark (`speed`, its workloads and
tables in `bench_table`) and the big-model loading benchmark (`offload`), the kernel and family checks of `energyzoo
doctor` (`kernels`, `families`, `task_inputs`) and the GPU check (`gpu_check`)."""
