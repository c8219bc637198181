resource "aws_lambda_function_url" "this" {
  count = local.create && var.create_function_url ? 1 : 0

  function_name      = aws_lambda_function.this[0].function_name
  qualifier          = local.qualifier
  authorization_type = var.function_url_authorization_type
  invoke_mode        = var.invoke_mode

  lifecycle {
    # The provider adds a NONE URL's public statements only when it creates the URL, so a new
    # auth type replaces the URL instead of updating it.
    replace_triggered_by = [terraform_data.url_authorization_type[count.index]]

    precondition {
      condition     = var.function_url_authorization_type == "AWS_IAM" || var.signing_key_secret_arn != null
      error_message = "function_url_authorization_type = \"NONE\" opens the URL to anyone: set signing_key_secret_arn so every request must carry a valid X-Spillway-Signature."
    }
  }

  depends_on = [aws_lambda_alias.this]
}

resource "terraform_data" "url_authorization_type" {
  count = local.create && var.create_function_url ? 1 : 0

  input = var.function_url_authorization_type
}

# Since October 2025 a call through a function URL needs both lambda:InvokeFunctionUrl and
# lambda:InvokeFunction. For a NONE URL the URL resource grants anyone the first when it creates
# the URL (statement FunctionURLAllowPublicAccess) and, with hashicorp/aws >= 6.28, the second
# too. This permission holds the second in state, scoped to the alias: it also covers URLs
# created before the provider added it, and it leaves with the module.
resource "aws_lambda_permission" "public_url" {
  count = local.create && var.create_function_url && local.public_url ? 1 : 0
  #checkov:skip=CKV_AWS_301:Only with function_url_authorization_type = NONE, which a precondition ties to a mandatory signing secret; only through the URL.

  statement_id             = "SpillwayPublicUrlInvoke"
  action                   = "lambda:InvokeFunction"
  function_name            = aws_lambda_function.this[0].function_name
  qualifier                = local.qualifier
  principal                = "*"
  invoked_via_function_url = true

  depends_on = [aws_lambda_function_url.this]
}

# AWS_IAM: the gateway's principals may call the URL (SigV4); aws_lambda_permission.invoke
# below grants them the lambda:InvokeFunction a URL call needs as well.
resource "aws_lambda_permission" "invoke_url" {
  for_each = local.create && var.create_function_url && !local.public_url ? local.invoker_principal : {}

  statement_id           = "SpillwayUrl-${each.key}"
  action                 = "lambda:InvokeFunctionUrl"
  function_name          = aws_lambda_function.this[0].function_name
  qualifier              = local.qualifier
  principal              = each.value
  function_url_auth_type = "AWS_IAM"

  depends_on = [aws_lambda_alias.this]
}

resource "aws_lambda_permission" "invoke" {
  for_each = local.create ? local.invoker_principal : {}

  statement_id  = "SpillwayInvoke-${each.key}"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.this[0].function_name
  qualifier     = local.qualifier
  principal     = each.value

  depends_on = [aws_lambda_alias.this]
}
