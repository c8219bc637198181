output "spillway_targets" {
  description = "One object per cloud target (name, kind, mode, url, function_name, qualifier, region, concurrency_cap, cold_start_ms); pipe it to `python -m gateway_plugin import-targets`."
  value       = local.targets
}

output "aws_ecr_repository_url" {
  description = "Where to push the images/aws-lambda image."
  value       = module.aws.ecr_repository_url
}

output "aws_warmup_payload" {
  description = "The warm-up ping the EventBridge schedules send."
  value       = module.aws.warmup_payload
}

output "aliyun_warmup_payload" {
  description = "The warm-up ping the FC timer triggers send."
  value       = module.aliyun.warmup_payload
}
