output "function_name" {
  description = "Name of the Lambda function."
  value       = try(aws_lambda_function.this[0].function_name, null)
}

output "function_arn" {
  description = "Unqualified ARN of the Lambda function."
  value       = try(aws_lambda_function.this[0].arn, null)
}

output "function_version" {
  description = "Version published by this apply (\"$LATEST\" when no alias is created)."
  value       = try(aws_lambda_function.this[0].version, null)
}

output "qualifier" {
  description = "Alias the URL, schedules and gateway use, or null when no alias is created."
  value       = local.create ? local.qualifier : null
}

output "invoke_arn" {
  description = "ARN the gateway and the warm-up schedules invoke (the alias ARN when there is an alias)."
  value       = local.create ? local.invoke_arn : null
}

output "function_url" {
  description = "Function URL (the gateway's upstream endpoint)."
  value       = try(aws_lambda_function_url.this[0].function_url, null)
}

output "function_url_authorization_type" {
  description = "Auth type of the function URL: AWS_IAM (SigV4) or NONE (Spillway signature only)."
  value       = try(aws_lambda_function_url.this[0].authorization_type, null)
}

output "reserved_concurrent_executions" {
  description = "Concurrency cap of the function (its spend cap)."
  value       = try(aws_lambda_function.this[0].reserved_concurrent_executions, null)
}

output "region" {
  description = "Region the function runs in."
  value       = local.create ? try(data.aws_region.current.region, null) : null
}

output "ecr_repository_url" {
  description = "URL of the created ECR repository (push the image here)."
  value       = try(aws_ecr_repository.this[0].repository_url, null)
}

output "ecr_repository_arn" {
  description = "ARN of the created ECR repository."
  value       = try(aws_ecr_repository.this[0].arn, null)
}

output "image_uri" {
  description = "Image the function runs."
  value       = try(aws_lambda_function.this[0].image_uri, null)
}

output "role_arn" {
  description = "ARN of the function's execution role."
  value       = try(aws_iam_role.this[0].arn, null)
}

output "log_group_name" {
  description = "Name of the function's CloudWatch log group."
  value       = try(aws_cloudwatch_log_group.this[0].name, null)
}

output "log_group_arn" {
  description = "ARN of the function's CloudWatch log group."
  value       = try(aws_cloudwatch_log_group.this[0].arn, null)
}

output "warmup_schedule_arns" {
  description = "ARNs of the EventBridge Scheduler warm-up schedules."
  value       = try(aws_scheduler_schedule.this[*].arn, [])
}

output "warmup_role_arn" {
  description = "ARN of the role the schedules assume (lambda:InvokeFunction on this function only)."
  value       = try(aws_iam_role.scheduler[0].arn, null)
}

output "warmup_payload" {
  description = "The warm-up ping each schedule sends, as functions.contract.warmup_payload renders it."
  value       = local.create ? local.warmup_payload : null
}
