data "alicloud_account" "current" {}

data "alicloud_regions" "current" {
  current = true
}

locals {
  create      = var.create
  region      = try(data.alicloud_regions.current.regions[0].id, "")
  account_id  = try(data.alicloud_account.current.id, "")
  slug        = lower(var.name)
  log_project = substr("spillway-${local.slug}-${local.account_id}", 0, 63)
  log_store   = "function"
  image_repo  = regex("^[^/]+/([^/]+)/([^:@/]+)", var.image)
  acr_pull_resources = var.acr_pull_resource_arns != null ? var.acr_pull_resource_arns : [
    "acs:cr:${local.region}:${local.account_id}:repository/${local.image_repo[0]}/${local.image_repo[1]}",
  ]

  # The signing key comes only from a file on a read-only OSS mount: the function reads
  # SPILLWAY_SIGNING_KEY_FILE at init (it cannot read Alibaba KMS secrets, and refuses to start
  # when SPILLWAY_SIGNING_KEY_SECRET_NAME is set).
  signing_key_mount_dir = "/mnt/spillway-key"
  signing_key_oss = var.signing_key_oss == null ? null : {
    bucket      = var.signing_key_oss.bucket
    bucket_path = "/${var.signing_key_oss.object_dir}"
    endpoint    = coalesce(var.signing_key_oss.endpoint, "https://oss-${local.region}-internal.aliyuncs.com")
    file        = "${local.signing_key_mount_dir}/${var.signing_key_oss.file_name}"
    bucket_arn  = "acs:oss:*:${local.account_id}:${var.signing_key_oss.bucket}"
    prefix      = "${var.signing_key_oss.object_dir}/"
  }

  # Read-only mount of the key's folder: its objects, and listing under its prefix only. The
  # for expression yields both statements per key and none without one: a conditional could not,
  # since its two results ([] and two statements of different shapes) must have the same type.
  signing_key_statements = flatten([
    for key in local.signing_key_oss[*] : [
      {
        Effect   = "Allow"
        Action   = ["oss:GetObject"]
        Resource = ["${key.bucket_arn}/${key.prefix}", "${key.bucket_arn}/${key.prefix}*"]
      },
      {
        Effect    = "Allow"
        Action    = ["oss:ListObjects"]
        Resource  = [key.bucket_arn]
        Condition = { StringLike = { "oss:Prefix" = [key.prefix, "${key.prefix}*"] } }
      },
    ]
  ])

  # Exactly functions.contract.warmup_payload(dwell_ms, models, probe): jsonencode sorts keys.
  warmup_payload = jsonencode({ spillway_warmup = { dwell_ms = var.warmup_dwell_ms, models = var.models, probe = var.warmup_probe } })

  environment = merge(
    var.environment_variables,
    {
      SPILLWAY_MODELS                 = join(",", var.models)
      SPILLWAY_MODEL_REPOSITORY       = "/opt/spillway/models"
      SPILLWAY_ALLOW_UNSIGNED_PAYLOAD = var.allow_unsigned_payload ? "1" : "0"
    },
    local.signing_key_oss == null ? {} : { SPILLWAY_SIGNING_KEY_FILE = local.signing_key_oss.file },
  )
}

resource "alicloud_log_project" "this" {
  count = local.create ? 1 : 0

  project_name = local.log_project
  description  = "Logs of the Spillway function ${var.name}"
}

resource "alicloud_log_store" "this" {
  count = local.create ? 1 : 0

  project_name     = alicloud_log_project.this[0].project_name
  logstore_name    = local.log_store
  retention_period = var.log_retention_in_days
  shard_count      = 2
}

resource "alicloud_ram_role" "this" {
  count = local.create ? 1 : 0

  role_name   = "${var.name}-fc"
  description = "Execution role of the Spillway function ${var.name}"
  assume_role_policy_document = jsonencode({
    Version = "1"
    Statement = [{
      Action    = "sts:AssumeRole"
      Effect    = "Allow"
      Principal = { Service = ["fc.aliyuncs.com"] }
    }]
  })
  tags = var.tags
}

resource "alicloud_ram_policy" "this" {
  count = local.create ? 1 : 0

  policy_name = "${var.name}-fc"
  description = "Logs, image pull and signing key of the Spillway function ${var.name}"
  policy_document = jsonencode({
    Version = "1"
    Statement = concat(
      [
        {
          Effect   = "Allow"
          Action   = ["log:PostLogStoreLogs"]
          Resource = ["acs:log:${local.region}:${local.account_id}:project/${local.log_project}/logstore/${local.log_store}"]
        },
        { Effect = "Allow", Action = ["cr:PullRepository"], Resource = local.acr_pull_resources },
        { Effect = "Allow", Action = ["cr:GetAuthorizationToken"], Resource = ["*"] },
      ],
      local.signing_key_statements,
    )
  })
}

resource "alicloud_ram_role_policy_attachment" "this" {
  count = local.create ? 1 : 0

  role_name   = alicloud_ram_role.this[0].role_name
  policy_name = alicloud_ram_policy.this[0].policy_name
  policy_type = "Custom"
}

resource "alicloud_fcv3_function" "this" {
  count = local.create ? 1 : 0

  function_name         = var.name
  description           = "Spillway function: a Triton sidecar behind a KServe v2 handler"
  runtime               = "custom-container"
  handler               = "not-used"
  role                  = alicloud_ram_role.this[0].arn
  cpu                   = var.cpu
  memory_size           = var.memory_size
  disk_size             = var.disk_size
  timeout               = var.timeout
  instance_concurrency  = var.instance_concurrency
  internet_access       = var.internet_access
  environment_variables = local.environment
  tags                  = var.tags

  custom_container_config {
    image      = var.image
    port       = 9000
    entrypoint = var.container_entrypoint
    command    = var.container_command

    health_check_config {
      http_get_url          = "/v2/health/ready"
      initial_delay_seconds = 1
      period_seconds        = 2
      timeout_seconds       = 2
      failure_threshold     = 60
      success_threshold     = 1
    }
  }

  dynamic "oss_mount_config" {
    for_each = local.signing_key_oss == null ? [] : [local.signing_key_oss]

    content {
      mount_points {
        bucket_name = oss_mount_config.value.bucket
        bucket_path = oss_mount_config.value.bucket_path
        endpoint    = oss_mount_config.value.endpoint
        mount_dir   = local.signing_key_mount_dir
        read_only   = true
      }
    }
  }

  dynamic "gpu_config" {
    for_each = var.gpu_type == null ? [] : [var.gpu_type]

    content {
      gpu_type        = gpu_config.value
      gpu_memory_size = var.gpu_memory_size
    }
  }

  log_config {
    project                 = alicloud_log_project.this[0].project_name
    logstore                = alicloud_log_store.this[0].logstore_name
    log_begin_rule          = "DefaultRegex"
    enable_request_metrics  = true
    enable_instance_metrics = true
  }

  lifecycle {
    precondition {
      condition     = var.memory_size >= var.cpu * 1024 && var.memory_size <= var.cpu * 4096
      error_message = "memory_size (GB) must be between 1 and 4 times cpu."
    }
  }

  depends_on = [alicloud_ram_role_policy_attachment.this]
}

resource "alicloud_fcv3_concurrency_config" "this" {
  count = local.create ? 1 : 0

  function_name        = alicloud_fcv3_function.this[0].function_name
  reserved_concurrency = var.reserved_concurrency
}

resource "alicloud_fcv3_provision_config" "this" {
  count = local.create && var.provisioned_instances > 0 ? 1 : 0

  function_name       = alicloud_fcv3_function.this[0].function_name
  qualifier           = var.qualifier
  target              = var.provisioned_instances
  always_allocate_cpu = true
  always_allocate_gpu = var.gpu_type != null

  lifecycle {
    precondition {
      condition     = var.provisioned_instances * var.instance_concurrency <= var.reserved_concurrency
      error_message = "provisioned_instances x instance_concurrency cannot exceed reserved_concurrency."
    }
  }

  depends_on = [alicloud_fcv3_concurrency_config.this]
}
