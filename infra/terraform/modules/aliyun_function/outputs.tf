output "function_name" {
  description = "Name of the FC function."
  value       = try(alicloud_fcv3_function.this[0].function_name, null)
}

output "function_arn" {
  description = "ARN of the FC function."
  value       = try(alicloud_fcv3_function.this[0].function_arn, null)
}

output "qualifier" {
  description = "Version or alias the triggers target."
  value       = local.create ? var.qualifier : null
}

output "http_trigger_url" {
  description = "URL of the HTTP trigger the gateway calls: the public one, or the VPC one when the public URL is disabled."
  value       = try(var.disable_url_internet ? alicloud_fcv3_trigger.http[0].http_trigger[0].url_intranet : alicloud_fcv3_trigger.http[0].http_trigger[0].url_internet, null)
}

output "http_trigger_url_intranet" {
  description = "VPC URL of the HTTP trigger."
  value       = try(alicloud_fcv3_trigger.http[0].http_trigger[0].url_intranet, null)
}

output "http_auth_type" {
  description = "Auth type of the HTTP trigger (function: FC-signed requests)."
  value       = local.create ? var.http_auth_type : null
}

output "reserved_concurrency" {
  description = "Concurrency cap of the function (its spend cap), in requests."
  value       = try(alicloud_fcv3_concurrency_config.this[0].reserved_concurrency, null)
}

output "region" {
  description = "Region the function runs in."
  value       = local.create ? local.region : null
}

output "role_arn" {
  description = "ARN of the function's RAM role."
  value       = try(alicloud_ram_role.this[0].arn, null)
}

output "log_project" {
  description = "SLS project holding the function's logs."
  value       = try(alicloud_log_project.this[0].project_name, null)
}

output "log_store" {
  description = "SLS log store holding the function's logs."
  value       = try(alicloud_log_store.this[0].logstore_name, null)
}

output "warmup_trigger_names" {
  description = "Names of the timer triggers that send warm-up pings."
  value       = try(alicloud_fcv3_trigger.warmup[*].trigger_name, [])
}

output "warmup_payload" {
  description = "The warm-up ping each timer sends, as functions.contract.warmup_payload renders it."
  value       = local.create ? local.warmup_payload : null
}
