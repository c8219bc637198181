module "aws" {
  source = "../../modules/aws_function"

  name                           = var.name
  models                         = var.models
  image_tag                      = var.aws_image_tag
  memory_size                    = 4096
  reserved_concurrent_executions = var.aws_reserved_concurrency
  signing_key_secret_arn         = var.aws_signing_key_secret_arn
  allow_unsigned_payload         = var.aws_signing_key_secret_arn != null
  invoker_principal_arns         = var.aws_gateway_principal_arns
  warmup_pings                   = 2

  tags = { project = "spillway" }
}

module "aliyun" {
  source = "../../modules/aliyun_function"

  name                 = var.name
  models               = var.models
  image                = var.aliyun_image
  reserved_concurrency = var.aliyun_reserved_concurrency
  instance_concurrency = 4
  warmup_pings         = 1

  tags = { project = "spillway" }
}

locals {
  targets = [
    {
      name            = "aws"
      kind            = "aws_lambda"
      mode            = "upstream"
      url             = module.aws.function_url
      function_name   = module.aws.function_name
      qualifier       = module.aws.qualifier
      region          = var.aws_region
      concurrency_cap = module.aws.reserved_concurrent_executions
      cold_start_ms   = var.aws_cold_start_ms
    },
    {
      name            = "aliyun"
      kind            = "aliyun_fc"
      mode            = "upstream"
      url             = module.aliyun.http_trigger_url
      function_name   = module.aliyun.function_name
      qualifier       = module.aliyun.qualifier == "LATEST" ? null : module.aliyun.qualifier
      region          = var.aliyun_region
      concurrency_cap = module.aliyun.reserved_concurrency
      cold_start_ms   = var.aliyun_cold_start_ms
    },
  ]
}
