data "aws_region" "current" {}

data "aws_caller_identity" "current" {}

locals {
  create           = var.create
  image_uri        = coalesce(var.image_uri, "${try(aws_ecr_repository.this[0].repository_url, "unset")}:${var.image_tag}")
  qualifier        = var.create_alias ? var.alias_name : null
  invoke_arn       = var.create_alias ? try(aws_lambda_alias.this[0].arn, "") : try(aws_lambda_function.this[0].arn, "")
  create_schedules = local.create && var.warmup_pings > 0
  public_url       = var.function_url_authorization_type == "NONE"

  # Permission statement ids are 1-100 letters, digits, '-' and '_': the principal's name (at
  # most 64 characters) and a hash of its whole ARN keep them short and distinct whatever the
  # role's path.
  invoker_principal = {
    for p in distinct(var.invoker_principal_arns) :
    "${replace(regex("[^/:]+$", p), "/[^A-Za-z0-9_-]/", "-")}-${substr(sha256(p), 0, 8)}" => p
  }

  # Exactly functions.contract.warmup_payload(dwell_ms, models, probe): jsonencode sorts keys.
  warmup_payload = jsonencode({ spillway_warmup = { dwell_ms = var.warmup_dwell_ms, models = var.models, probe = var.warmup_probe } })

  environment = merge(
    var.environment_variables,
    {
      SPILLWAY_MODELS                 = join(",", var.models)
      SPILLWAY_MODEL_REPOSITORY       = "/opt/spillway/models"
      SPILLWAY_ALLOW_UNSIGNED_PAYLOAD = var.allow_unsigned_payload ? "1" : "0"
    },
    var.signing_key_secret_arn == null ? {} : { SPILLWAY_SIGNING_KEY_SECRET_ARN = var.signing_key_secret_arn },
  )
}

resource "aws_ecr_repository" "this" {
  count = local.create && var.create_ecr_repository ? 1 : 0

  name                 = var.name
  image_tag_mutability = var.ecr_image_tag_mutability

  image_scanning_configuration {
    scan_on_push = true
  }

  encryption_configuration {
    encryption_type = var.ecr_kms_key_arn == null ? "AES256" : "KMS"
    kms_key         = var.ecr_kms_key_arn
  }

  tags = var.tags
}

resource "aws_ecr_lifecycle_policy" "this" {
  count = local.create && var.create_ecr_repository ? 1 : 0

  repository = aws_ecr_repository.this[0].name
  policy = jsonencode({
    rules = [{
      rulePriority = 1
      description  = "Keep the ${var.ecr_keep_images} most recent images"
      selection    = { tagStatus = "any", countType = "imageCountMoreThan", countNumber = var.ecr_keep_images }
      action       = { type = "expire" }
    }]
  })
}

resource "aws_cloudwatch_log_group" "this" {
  count = local.create ? 1 : 0
  #checkov:skip=CKV_AWS_338:Retention is a variable (default 30 days) sized for operational logs; raise it where policy asks.

  name              = "/aws/lambda/${var.name}"
  retention_in_days = var.log_retention_in_days
  kms_key_id        = var.log_kms_key_arn
  tags              = var.tags
}

data "aws_iam_policy_document" "assume_lambda" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "execution" {
  count = local.create ? 1 : 0

  statement {
    sid       = "WriteOwnLogGroup"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.this[0].arn}:*"]
  }

  dynamic "statement" {
    for_each = var.signing_key_secret_arn == null ? [] : [var.signing_key_secret_arn]

    content {
      sid       = "ReadSigningKey"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = [statement.value]
    }
  }

  dynamic "statement" {
    for_each = var.signing_key_kms_key_arn == null ? [] : [var.signing_key_kms_key_arn]

    content {
      sid       = "DecryptSigningKey"
      actions   = ["kms:Decrypt"]
      resources = [statement.value]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["secretsmanager.${data.aws_region.current.region}.amazonaws.com"]
      }
    }
  }
}

resource "aws_iam_role" "this" {
  count = local.create ? 1 : 0

  name               = "${var.name}-execution"
  assume_role_policy = data.aws_iam_policy_document.assume_lambda.json
  tags               = var.tags
}

resource "aws_iam_role_policy" "this" {
  count = local.create ? 1 : 0

  name   = "spillway-function"
  role   = aws_iam_role.this[0].id
  policy = data.aws_iam_policy_document.execution[0].json
}

resource "aws_lambda_function" "this" {
  count = local.create ? 1 : 0
  #checkov:skip=CKV_AWS_50:X-Ray needs xray:PutTraceSegments on Resource "*", which this role deliberately lacks.
  #checkov:skip=CKV_AWS_116:Invocations are synchronous (URL, Invoke); the only async ones are warm-up pings, safe to drop.
  #checkov:skip=CKV_AWS_117:It calls only its own Triton on localhost and Secrets Manager; a VPC would add NAT or endpoints, no isolation.
  #checkov:skip=CKV_AWS_272:Lambda code signing applies to .zip packages only, not to container images.

  function_name                  = var.name
  description                    = "Spillway function: a Triton sidecar behind a KServe v2 handler"
  role                           = aws_iam_role.this[0].arn
  package_type                   = "Image"
  image_uri                      = local.image_uri
  architectures                  = [var.architecture]
  memory_size                    = var.memory_size
  timeout                        = var.timeout
  reserved_concurrent_executions = var.reserved_concurrent_executions
  publish                        = var.create_alias
  kms_key_arn                    = var.kms_key_arn

  ephemeral_storage {
    size = var.ephemeral_storage_size
  }

  # A streaming URL needs a runtime that streams: the image's own, in place of awslambdaric.
  dynamic "image_config" {
    for_each = var.invoke_mode == "RESPONSE_STREAM" ? [1] : []
    content {
      entry_point = ["python", "-m", "functions", "lambda-runtime"]
      command     = []
    }
  }

  environment {
    variables = local.environment
  }

  logging_config {
    log_format = "Text"
    log_group  = aws_cloudwatch_log_group.this[0].name
  }

  tags = var.tags

  lifecycle {
    precondition {
      condition     = var.image_uri != null || var.create_ecr_repository
      error_message = "Set image_uri, or let the module create the ECR repository (create_ecr_repository = true)."
    }
  }

  depends_on = [aws_iam_role_policy.this]
}

resource "aws_lambda_alias" "this" {
  count = local.create && var.create_alias ? 1 : 0

  name             = var.alias_name
  function_name    = aws_lambda_function.this[0].function_name
  function_version = aws_lambda_function.this[0].version
}

resource "aws_lambda_provisioned_concurrency_config" "this" {
  count = local.create && var.create_alias && var.provisioned_concurrent_executions > 0 ? 1 : 0

  function_name                     = aws_lambda_alias.this[0].function_name
  qualifier                         = aws_lambda_alias.this[0].name
  provisioned_concurrent_executions = var.provisioned_concurrent_executions

  lifecycle {
    precondition {
      condition     = var.provisioned_concurrent_executions <= var.reserved_concurrent_executions
      error_message = "provisioned_concurrent_executions cannot exceed reserved_concurrent_executions."
    }
  }
}
